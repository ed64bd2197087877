"""Tests for the analysis package."""
