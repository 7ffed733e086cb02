"""The project as a whole: public surface, import layout, docs, builds, packaging."""
