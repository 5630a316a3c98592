"""What runs in the agent's domain (the agent's user and privileges).

Producers publish files into an agent's working directory and never import the projection
service (`bridge`) or any chat channel (`channels`). The service reads what they publish only
through each producer's contract module (for the task card: `producers.task_card.contract`).

May import: `producers`.
"""
