"""The data model every stage speaks: the op DAG (`graph`), the traced timings (`trace`),
the time oracle (`oracle`), plans (`plan`), step records, array helpers and the
collectives' waits for their peers (`waits`, computed where a trace is read)."""
