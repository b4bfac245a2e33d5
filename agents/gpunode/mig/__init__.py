"""MIG: config selection, an exact placement planner, `gpunode-mig` and the MIG manager daemon.

The mig-parted-compatible file formats (config, hooks, GPU clients) are in :mod:`gpunode.api`."""

#: where an apply records its progress unless told otherwise (`--journal-file`, MIG_PARTED_JOURNAL_FILE)
DEFAULT_JOURNAL = "/var/lib/gpunode/mig/journal.json"
