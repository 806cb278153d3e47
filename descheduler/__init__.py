"""Descheduler that re-creates pods the lower cluster cannot place."""
