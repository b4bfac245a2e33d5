"""Generated package podresources.v1; never hand-edited."""
