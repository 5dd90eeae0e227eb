"""What every codec shares: header-field rules today; the neutral exchange grows here."""
