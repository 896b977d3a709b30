"""Schedulers: orders and priorities for the transfers of a training iteration."""
