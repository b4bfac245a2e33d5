"""MIG: the mig-parted-compatible config format, an exact placement planner, `gpunode-mig` and the MIG
manager daemon."""

#: where an apply records its progress unless told otherwise (`--journal-file`, MIG_PARTED_JOURNAL_FILE)
DEFAULT_JOURNAL = "/var/lib/gpunode/mig/journal.json"
