"""A second file, so breakpoints span two sources."""


def scale(value, factor):
    scaled = value * factor
    return scaled
