"""The research studies run with memsearch: pilots, registered bars, published results and their
diagnostics (studies/README.md). Nothing under src/ imports this package; a study imports the
library and applies what it registered before its numbers existed."""
