"""Views of programs for people: canonical text views (for diffs and snapshots) and the HTML graph."""
