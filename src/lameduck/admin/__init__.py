"""The admin API: Envoy-compatible endpoints on a loopback port."""

from lameduck.admin.control import AdminControl
from lameduck.admin.handlers import AdminHandlers
from lameduck.admin.server import start_admin

__all__ = ["AdminControl", "AdminHandlers", "start_admin"]
