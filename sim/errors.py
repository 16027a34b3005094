"""The one error type users see: a clear message, no traceback, exit status 2."""

from __future__ import annotations


class KvsimError(Exception):
    """A user-facing error: bad config, bad trace row, a model that does not fit.

    The CLI prints ``str(error)`` as one message and exits with status 2.
    """


class ConfigError(KvsimError):
    """A configuration value is missing, malformed or inconsistent."""

    def __init__(self, message: str, *, source: str | None = None, key: str | None = None):
        self.message = message
        self.source = source
        self.key = key
        where = ": ".join(part for part in (source, key and f"key '{key}'") if part)
        super().__init__(f"{where}: {message}" if where else message)

    def at(self, source: str) -> ConfigError:
        """This error attributed to ``source`` (a config file) unless it names one already."""
        if self.source is not None:
            return self
        return ConfigError(self.message, source=source, key=self.key)
