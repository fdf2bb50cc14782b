"""What the two HTTP adapters (the API, service/api/, and the page, service/web/) share:
sessions and callers (`deps`), the checks before any route (`guard`), and the one map from
the error hierarchy to HTTP statuses (`errors`)."""
