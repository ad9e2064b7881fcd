"""Data access: the DynamoDB tables (the remediation ledger, approvals, canary runs).

Every key is ``keys``'; every call to DynamoDB goes through ``dynamo.Table``, which holds the
conditional-write, lost-race and paging idioms once. ``ledger.Ledger`` composes the ledger's
concerns (``admission_store``, ``claims``, ``holds``, ``events``, ``notices``). Each table's
items are described in docs/CONTRACT.md ("DynamoDB tables"); the policies that decide what to
write are ``sdc_remediation.logic``'s, passed in where a store needs one."""
