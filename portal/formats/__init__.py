"""Format overrides per language (``FORMAT_MODULE_PATH``); Django's own formats fill in the rest."""
