"""Side-by-side measurements of knopt against its peers; each module is a script."""
