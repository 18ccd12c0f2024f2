"""Application drivers the CLI and the nightly call: parity runs and benches over a prepared model."""
