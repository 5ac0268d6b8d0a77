"""Reading topics back for people and scripts (node side): decisions, a job's shipped lines,
status snapshots, on-demand diagnoses, and how each is rendered for a terminal or as JSON
lines. The CLI's commands (faultwatch/cli) only pass their arguments in."""
