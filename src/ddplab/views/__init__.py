"""Views: sentences, HTML, the live status line, timelines and plots, made from a result's fields
when shown; never parsed back.
"""
