"""Schedulers: orders and priorities for the transfers of a training iteration."""

from planner.api import callable_module  # noqa: E402

callable_module(__name__)  # `planner.schedule(...)` is the API function (docs/api.md)
