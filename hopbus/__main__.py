from hopbus.cli.main import main

main()
