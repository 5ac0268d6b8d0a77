"""Rule sets rolled out to the processors (operator and processor side, no Faust): the pushed
record and its numbered history (`rules push`, `rollback`, `history`), the check a write
makes before it is sent, what each worker runs (`rules show`, `status`), and the processors'
follower of the rules topic."""
