"""Who may make faultwatch act: Ed25519 keys and trust files (keys), signed JSON records
(records: decisions, rule sets, registry records), node signatures on logs records (nodesig)
and the replay rule for decisions (replay). See docs/operating.md, "Keys and trust"."""
