"""get_logger as TVM's meta_schedule/logging.py has it."""

import logging
from logging import Logger


def get_logger(name: str) -> Logger:
    return logging.getLogger(name)
