"""hpcwatch.web"""
