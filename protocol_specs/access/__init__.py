"""Who may do what: tokens and scopes, the one permission table, the audit trail of refusals, and secrets kept out of a program's output."""
