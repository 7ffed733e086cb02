"""The operator's tools: ``inspect``, ``top``, ``add``, ``forget``, ``delete``, the dashboard."""
