"""Data access: the DynamoDB tables (the remediation ledger, approvals, canary runs) and the
attribute-value conversion they share. Each table's items are described in docs/CONTRACT.md
("DynamoDB tables"); the policies that decide what to write are ``sdc_remediation.logic``'s."""
