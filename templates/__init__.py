"""Jinja CUDA templates, one file per kernel family (package so the files ship as data)."""

from pathlib import Path

DIR = Path(__file__).resolve().parent
