"""``keyqueue lab``: its commands, the pipeline and its API server, the web page."""
