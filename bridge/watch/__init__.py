"""Watch: which agents may have changed, from one file watcher over every workdir.

The first step of the data path. It knows the contract folders of each workdir and turns file
system events (plus a periodic rescan) into sets of agent ids; it reads no file contents.

May import: the standard library, watchfiles, inotify_simple, `producers.*.contract`,
`channels.aio`. Nothing else of `bridge`.
"""
