"""texir's command-line interface (`texir --help`)."""
