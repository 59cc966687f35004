"""Root conftest: the project's own tests drive the plugin end to end with pytester."""

pytest_plugins = ("pytester",)
