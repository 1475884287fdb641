"""Device detection (import-free), families, profiles and adaptors."""
