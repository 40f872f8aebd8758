"""The bench behind the lesson path: loading, measuring, plotting, inspecting; no lesson module
imports it."""
