"""Generated package deviceplugin; never hand-edited."""
