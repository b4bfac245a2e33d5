"""Generated package podresources; never hand-edited."""
