"""Reports, lineage and the inbox: what an agent returns, who created it, text sent to it.

Only the file contract lives here so far (`contract`): the paths and total parsers the service
reads and the message shape it writes into the inbox.

May import: `producers.task_card.contract`.
"""
