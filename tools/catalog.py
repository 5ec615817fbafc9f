"""Imports every tool module so that its tools register. Add a module here when you add tools."""
