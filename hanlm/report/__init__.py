"""The run's report card: report.md (card) and its figures (plots)."""
