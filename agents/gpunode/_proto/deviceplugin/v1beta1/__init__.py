"""Generated package deviceplugin.v1beta1; never hand-edited."""
