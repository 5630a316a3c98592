"""Follow: reading an agent's files as untrusted input, safely and incrementally.

`safe_read` opens only regular files whose resolved path stays inside the agent's resolved
workdir, never blocking on the event loop; `tail` follows append-only JSONL logs by (inode,
offset) across rotation and truncation. No parsing of meaning here: that is `track`'s job.

May import: the standard library, `producers.*.contract`.
"""
