"""The package version, in a module of its own: modules that report it (the results file's
environment, the HTML report, the client's User-Agent) import it from here, not from the
package ``__init__``, so they import nothing that the package's public API imports."""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
