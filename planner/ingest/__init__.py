"""Readers, one module per input format, and format sniffing (detect)."""
