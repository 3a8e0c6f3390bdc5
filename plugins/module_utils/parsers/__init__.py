"""Parsers shared by deploy, verify and the doctor: command output and files as the nodes print them."""
