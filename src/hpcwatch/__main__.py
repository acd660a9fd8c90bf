from hpcwatch.cli import main

main()
