"""Shared test configuration. Area-specific fixtures live in each test folder's conftest."""
