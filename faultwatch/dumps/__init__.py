"""What the ranks' own dumps say about a hang (pure): Flight Recorder dumps and Python stacks
read into who waits, who never joined (the job stage's diagnosis is core/diagnosis.py; the
`faultwatch diagnose` command is cli/diagnose.py over readers/diagnose.py)."""
