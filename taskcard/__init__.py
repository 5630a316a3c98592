"""taskcard, installed as one namespace: `taskcard.bridge`, `.channels` and `.producers`.

In the repository these are the top-level folders `bridge/`, `channels/` and `producers/`;
the entries of this folder are links to them, so the code imports itself one way only
(`from taskcard.bridge...`), from a checkout and from an installed wheel alike, and no
top-level module name of ours (such as `channels`) can collide with another distribution's.
"""
