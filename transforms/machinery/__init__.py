"""What the passes stand on and users do not import: walking graphs and calls, building calls,
module tables and sharing, reading module stacks, argument checks, tracing functions into graphs,
and the law-violation error. Not public API: its modules may change with the passes. Imports
nothing itself."""
