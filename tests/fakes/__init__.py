"""Stateful fakes of the chat platforms' HTTP APIs, served on 127.0.0.1 for tests and benches."""
