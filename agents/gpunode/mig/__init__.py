"""MIG: config selection, an exact placement planner, `gpunode-mig` and the MIG manager daemon.

The mig-parted-compatible file formats (config, hooks, GPU clients) are in :mod:`gpunode.api`."""

#: the host directory that keeps MIG state across restarts and reboots (journal, reboot marker)
STATE_DIR = "/var/lib/gpunode/mig"
#: where an apply records its progress unless told otherwise (`--journal-file`, MIG_PARTED_JOURNAL_FILE)
DEFAULT_JOURNAL = f"{STATE_DIR}/journal.json"
