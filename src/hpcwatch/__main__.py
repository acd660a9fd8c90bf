from hpcwatch.cli import main

main(prog_name="python -m hpcwatch")
