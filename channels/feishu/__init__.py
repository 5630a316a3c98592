"""Feishu / Lark transport: interactive cards through lark-oapi (or a test fake)."""
