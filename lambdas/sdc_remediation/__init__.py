"""sdc_remediation: the remediation workflow domain layer."""
