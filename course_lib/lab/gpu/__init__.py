"""GPU benchmark runner internals: schema, records, measurement helpers, model provenance."""
