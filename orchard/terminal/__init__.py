"""The terminal: what orchard prints (one console for every line a user sees), its progress lines,
and the signals it gets (Ctrl-C, SIGTERM), turned into one exception."""
